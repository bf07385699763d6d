"""kcat (Debian's, with its own librdkafka 2.0.x build) against a real ads-broker process.

Every scenario checks the data exactly: each record once, offsets dense per partition, produce
order kept per partition, every key on one partition, keys, values and headers as sent.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient, KafkaProducer

from ads_broker.embedded import BrokerProcess
from tests.integration.compat.batches import batch_of, stored_batches
from tests.integration.compat.kcat import KcatMember, KcatRecord, consume_json, run, wait_until
from tests.kafka_helpers import create_topic

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4
CODECS = ("gzip", "snappy", "lz4", "zstd")


def produce_lines(kcat: str, bootstrap: str, topic: str, lines: list[tuple[str, str]], *args: str) -> None:
    """`kcat -P` with key delimiter ':' and an idempotent producer; ``args`` add codec, headers, ..."""
    stdin = "".join(f"{k}:{v}\n" for k, v in lines)
    run(kcat, bootstrap, ["-P", "-t", topic, "-K:", "-X", "enable.idempotence=true", "-X", "acks=all", *args], stdin)


def check_partitioned(records: list[KcatRecord], sent: list[tuple[str, str]]) -> dict[int, list[KcatRecord]]:
    """Each sent (key, value) once, offsets dense per partition, produce order kept, a key on one partition."""
    assert sorted((r.key, r.value) for r in records) == sorted(sent), "every record exactly once"
    order: dict[tuple[str | None, str | None], int] = {kv: i for i, kv in enumerate(sent)}
    by_partition: dict[int, list[KcatRecord]] = defaultdict(list)
    for r in records:
        by_partition[r.partition].append(r)
    for partition, rows in by_partition.items():
        assert [r.offset for r in rows] == list(range(len(rows))), f"partition {partition}: dense offsets"
        idx = [order[(r.key, r.value)] for r in rows]
        assert idx == sorted(idx), f"partition {partition}: produce order"
    homes: dict[str | None, set[int]] = defaultdict(set)
    for r in records:
        homes[r.key].add(r.partition)
    assert all(len(p) == 1 for p in homes.values()), "every key on exactly one partition"
    return by_partition


def test_idempotent_produce_with_every_codec_then_consume(kcat_bin: str, compat_broker: BrokerProcess,
                                                          topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    sent: list[tuple[str, str]] = []
    for codec in CODECS:
        # Repetitive values: librdkafka sends a batch uncompressed when compressing does not shrink it.
        lines = [(f"key-{j % 13}", f"{codec}-{j}-" + "abcd" * 20) for j in range(60)]
        produce_lines(kcat_bin, bs, topic_name, lines, "-z", codec, "-H", f"codec={codec}", "-H", "run=kcat")
        sent += lines
    records = consume_json(kcat_bin, bs, topic_name)
    by_partition = check_partitioned(records, sent)
    assert len(by_partition) == PARTITIONS, "13 keys spread over every partition"
    batches = {p: stored_batches(bs, topic_name, p) for p in range(PARTITIONS)}
    for r in records:
        assert r.value is not None
        assert r.headers == (("codec", r.value.split("-")[0]), ("run", "kcat")), r
        assert batch_of(batches[r.partition], r.offset).producer_id >= 0, "idempotent: batches carry a producer id"


# librdkafka before 2.11.1 (kcat's is 2.0.2) lets gzip, snappy and lz4 through only if ApiVersions
# lists Produce v0 (rdkafka_msgset_writer.c asks ApiVersion_supported(Produce, 0, 0)); otherwise it
# logs "Broker does not support compression type gzip: not compressing batch" at debug level and
# sends the batch uncompressed. ads-broker advertises Produce from v0 as Kafka 4.0 does
# (KAFKA-18659) while refusing v0-v2 (test_legacy_produce.py), so every codec reaches the log.
# zstd is gated on Produce v7 + Fetch v10 instead.
@pytest.mark.parametrize("codec", CODECS)
def test_codec_reaches_the_log(kcat_bin: str, compat_broker: BrokerProcess, topic_name: str, codec: str) -> None:
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, 1)
    lines = [(f"key-{j % 5}", f"{codec}-{j}-" + "abcd" * 20) for j in range(40)]
    produce_lines(kcat_bin, bs, topic_name, lines, "-p", "0", "-z", codec)
    assert [(r.key, r.value) for r in consume_json(kcat_bin, bs, topic_name)] == lines
    assert {b.codec for b in stored_batches(bs, topic_name, 0)} == {codec}


def test_consume_from_an_offset_and_a_count(kcat_bin: str, compat_broker: BrokerProcess, topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, 1)
    produce_lines(kcat_bin, bs, topic_name, [(f"k{i}", f"v{i}") for i in range(20)], "-p", "0")
    tail = consume_json(kcat_bin, bs, topic_name, "-p", "0", "-o", "12")
    assert [(r.offset, r.key, r.value) for r in tail] == [(i, f"k{i}", f"v{i}") for i in range(12, 20)]
    proc = run(kcat_bin, bs, ["-C", "-t", topic_name, "-p", "0", "-o", "-5", "-c", "3", "-f", "%o %k %s\\n"])
    assert proc.stdout.splitlines() == ["15 k15 v15", "16 k16 v16", "17 k17 v17"]


def test_metadata_listing_plain_and_json(kcat_bin: str, compat_broker: BrokerProcess, topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    meta = json.loads(run(kcat_bin, bs, ["-L", "-J"]).stdout)
    assert meta["brokers"] == [{"id": 0, "name": bs}]
    assert meta["controllerid"] == 0
    topics = {t["topic"]: t for t in meta["topics"]}
    assert topic_name in topics
    one = json.loads(run(kcat_bin, bs, ["-L", "-J", "-t", topic_name]).stdout)
    assert [t["topic"] for t in one["topics"]] == [topic_name]
    parts = one["topics"][0]["partitions"]
    assert parts == [{"partition": p, "leader": 0, "replicas": [{"id": 0}], "isrs": [{"id": 0}]}
                     for p in range(PARTITIONS)]
    assert "error" not in one["topics"][0]
    plain = run(kcat_bin, bs, ["-L", "-t", topic_name]).stdout
    assert f"broker 0 at {bs} (controller)" in plain
    assert f'topic "{topic_name}" with {PARTITIONS} partitions:' in plain


def test_group_consume_rebalances_when_a_second_member_joins(kcat_bin: str, compat_broker: BrokerProcess,
                                                             topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = [(f"key-{j % 13}", f"first-{j}") for j in range(80)]
    second = [(f"key-{j % 13}", f"second-{j}") for j in range(80)]
    produce_lines(kcat_bin, bs, topic_name, first)
    fast_commit = ("-X", "auto.commit.interval.ms=200")
    with KcatMember(kcat_bin, bs, group, topic_name, fast_commit) as a:
        wait_until(lambda: len(a.records()) >= len(first), "member A to read the first batch", context=a.describe)
        assert a.assignments() == [set(range(PARTITIONS))]
        with KcatMember(kcat_bin, bs, group, topic_name, fast_commit) as b:
            wait_until(lambda: len(b.assignments()) >= 1 and len(a.assignments()) >= 2,
                       "a rebalance giving member B partitions",
                       context=lambda: f"A:\n{a.describe()}\nB:\n{b.describe()}")
            a_now, b_now = a.assignments()[-1], b.assignments()[-1]
            assert a_now and b_now and a_now | b_now == set(range(PARTITIONS)) and not a_now & b_now
            produce_lines(kcat_bin, bs, topic_name, second)
            wait_until(lambda: len(a.records()) + len(b.records()) >= len(first) + len(second),
                       "both members to read the second batch",
                       context=lambda: f"A:\n{a.describe()}\nB:\n{b.describe()}")
        got_a, got_b = a.records(), b.records()
    assert {r.partition for r in got_b} <= b_now
    assert {r.partition for r in got_a[len(first):]} <= a_now
    by_partition = check_partitioned(sorted(got_a + got_b, key=lambda r: (r.partition, r.offset)), first + second)
    # Both members committed on close: the group's offsets are each partition's end (read by kafka-python).
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        committed = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    assert {tp.partition: om.offset for tp, om in committed.items()} == \
        {p: len(rows) for p, rows in by_partition.items()}


def test_read_committed_hides_aborted_and_open_transactions(kcat_bin: str, compat_broker: BrokerProcess,
                                                             topic_name: str) -> None:
    """Written by confluent-kafka's transactional producer, read by kcat at both isolation levels."""
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = Producer({"bootstrap.servers": bs, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}", "linger.ms": 5})
    p.init_transactions(30)
    outcome = [("commit", 5), ("abort", 4), ("commit", 3), ("open", 2)]
    for n, (fate, count) in enumerate(outcome):
        p.begin_transaction()
        for i in range(count):
            p.produce(topic_name, key=f"t{n}".encode(), value=f"{fate}-{n}-{i}".encode(), partition=0,
                      headers=[("txn", str(n).encode())])
        p.flush(30)
        if fate == "commit":
            p.commit_transaction(30)
        elif fate == "abort":
            p.abort_transaction(30)
    committed = consume_json(kcat_bin, bs, topic_name, "-X", "isolation.level=read_committed")
    # Offsets: txn 0 at 0-4 + marker 5; txn 1 at 6-9 + marker 10; txn 2 at 11-13 + marker 14; open at 15-16.
    assert [(r.offset, r.key, r.value, r.headers) for r in committed] == (
        [(i, "t0", f"commit-0-{i}", (("txn", "0"),)) for i in range(5)]
        + [(11 + i, "t2", f"commit-2-{i}", (("txn", "2"),)) for i in range(3)])
    everything = consume_json(kcat_bin, bs, topic_name, "-X", "isolation.level=read_uncommitted")
    assert [r.value for r in everything] == [f"{fate}-{n}-{i}" for n, (fate, c) in enumerate(outcome)
                                              for i in range(c)]
    assert [r.offset for r in everything] == [*range(5), *range(6, 10), *range(11, 14), 15, 16]
    p.abort_transaction(30)


def test_transactional_produce_then_query_offsets(kcat_bin: str, compat_broker: BrokerProcess,
                                                  topic_name: str) -> None:
    """kcat -P with a transactional.id writes its whole input in one transaction, committed at EOF."""
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, 1)
    txn = f"tx-{uuid.uuid4().hex[:8]}"
    proc = run(kcat_bin, bs, ["-P", "-t", topic_name, "-p", "0", "-K:", "-X", f"transactional.id={txn}"],
               "".join(f"k{i}:v{i}\n" for i in range(6)))
    assert "Transaction successfully committed" in proc.stderr
    committed = consume_json(kcat_bin, bs, topic_name, "-X", "isolation.level=read_committed")
    assert [(r.offset, r.key, r.value) for r in committed] == [(i, f"k{i}", f"v{i}") for i in range(6)]
    # -Q: offset lookup (ListOffsets); -1 is the log end: six records and the commit marker.
    ends = json.loads(run(kcat_bin, bs, ["-Q", "-t", f"{topic_name}:0:-1", "-J"]).stdout)
    assert ends[topic_name]["0"] == {"partition": 0, "offset": 7}
    starts = json.loads(run(kcat_bin, bs, ["-Q", "-t", f"{topic_name}:0:-2", "-J"]).stdout)
    assert starts[topic_name]["0"] == {"partition": 0, "offset": 0}


def test_consume_batches_compressed_by_another_client(kcat_bin: str, compat_broker: BrokerProcess,
                                                      topic_name: str) -> None:
    """kafka-python writes compressed batches with each codec; kcat (librdkafka 2.0.2) decodes each from ads-broker."""
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, 1)
    sent = []
    for codec in CODECS:
        producer = KafkaProducer(bootstrap_servers=bs, enable_idempotence=True, compression_type=codec, linger_ms=50)
        lines = [(f"{codec}-key-{j}", f"{codec}-{j}-" + "wxyz" * 10) for j in range(25)]
        for key, value in lines:
            producer.send(topic_name, key=key.encode(), value=value.encode(), partition=0,
                          headers=[("codec", codec.encode())])
        producer.flush(30)
        producer.close(10)
        sent += lines
    stored = stored_batches(bs, topic_name, 0)
    assert [batch_of(stored, i).codec for i in range(len(sent))] == [k.split("-")[0] for k, _ in sent], \
        "every batch stored with the codec it was sent with"
    records = consume_json(kcat_bin, bs, topic_name)
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == \
        [(i, k, v, (("codec", k.split("-")[0]),)) for i, (k, v) in enumerate(sent)]
