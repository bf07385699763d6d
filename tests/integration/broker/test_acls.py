"""ACLs end to end: a real broker with a SASL (SCRAM) listener, a PLAINTEXT one (principal
User:ANONYMOUS) and ``authorizer.class.name`` set; confluent-kafka as the client, raw frames where
an exact error code must be seen. Each test uses its own topics, groups and users' resources, so
one broker serves the module (the restart test starts its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.admin import DescribeAclsRequest
from kafka.protocol.consumer import JoinGroupRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient

PASSWORD = "pw-" + uuid.uuid4().hex[:8]
USERS = ("admin", "reader", "writer", "nobody", "pfx", "denied")
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


def cli(*args: str, data_dir: Path, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"ADS_BROKER_USER_PASSWORD": password} if password is not None else {})}
    return subprocess.run([sys.executable, "-m", "ads_broker", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def acl_add(data_dir: Path, *args: str) -> None:
    out = cli("acls", "add", *args, data_dir=data_dir)
    assert out.returncode == 0, out.stderr


@dataclass
class AclBroker:
    proc: BrokerProcess
    plain: int
    sasl: int
    data_dir: Path
    log_path: Path

    def conf(self, user: str | None, **extra: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"broker.address.family": "v4", "socket.timeout.ms": 10000, "log_level": 0}
        if user is None:
            conf.update({"bootstrap.servers": f"127.0.0.1:{self.plain}"})
        else:
            conf.update({"bootstrap.servers": f"127.0.0.1:{self.sasl}", "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": PASSWORD})
        conf.update(extra)
        return conf

    def admin(self, user: str | None = "admin") -> AdminClient:
        return AdminClient(self.conf(user))


def start_acl_broker(tmp_path: Path, data_dir: Path | None = None, **extra: str) -> AclBroker:
    data_dir = data_dir or tmp_path / "data"
    if not (data_dir / "__scram_credentials.json").exists():
        for user in USERS:
            out = cli("users", "add", user, data_dir=data_dir, password=PASSWORD)
            assert out.returncode == 0, out.stderr
    plain, sasl = free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:admin",
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        **extra,
    }
    log_path = tmp_path / f"broker-{uuid.uuid4().hex[:6]}.log"
    proc = ads_broker_process(data_dir, port=plain, config=config, log_path=log_path).start()
    return AclBroker(proc, plain, sasl, data_dir, log_path)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    tmp = tmp_path_factory.mktemp("acls")
    data_dir = tmp / "data"
    # Set up offline with the CLI, as an operator would before the first start.
    data_dir.mkdir()
    acl_add(data_dir, "--allow-principal", "User:reader", "--operation", "READ", "--topic", "readable",
            "--group", "readers")
    acl_add(data_dir, "--allow-principal", "User:writer", "--operation", "WRITE", "--operation", "CREATE",
            "--topic", "writable")
    acl_add(data_dir, "--allow-principal", "User:writer", "--operation", "IDEMPOTENT_WRITE", "--cluster")
    acl_add(data_dir, "--allow-principal", "User:pfx", "--operation", "ALL", "--topic", "team-a.",
            "--resource-pattern-type", "PREFIXED")
    acl_add(data_dir, "--allow-principal", "User:pfx", "--operation", "WRITE", "--operation", "DESCRIBE",
            "--transactional-id", "pfx-txn-", "--resource-pattern-type", "PREFIXED")
    acl_add(data_dir, "--allow-principal", "User:*", "--operation", "DESCRIBE", "--topic", "shared")
    acl_add(data_dir, "--allow-principal", "User:writer", "--allow-principal", "User:denied", "--operation", "ALL",
            "--topic", "shared")
    acl_add(data_dir, "--deny-principal", "User:denied", "--operation", "WRITE", "--topic", "shared")
    b = start_acl_broker(tmp, data_dir)
    try:
        admin = b.admin()
        for name in ("readable", "writable", "shared", "team-a.orders", "team-b.orders", "secret"):
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        produce(b.conf("admin"), "readable", 5)
        yield b
    finally:
        b.proc.stop()


def produce(conf: dict[str, Any], topic: str, n: int = 1, **extra: Any) -> list[KafkaError]:
    """Produce n records; the delivery errors (empty when all were written)."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "message.timeout.ms": 10000, **extra})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    return errors


def consume(conf: dict[str, Any], topic: str, group: str, want: int) -> tuple[list[bytes], list[KafkaError]]:
    """Consume up to ``want`` records from the group's position (the start when it has none), stopping
    at the end of the partition; (values, errors reported by poll). Without the end-of-partition
    event a group already committed at the end polled for its whole 30 s budget."""
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.subscribe([topic])
    got: list[bytes] = []
    errors: list[KafkaError] = []
    try:
        for _ in range(150):
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    errors.append(msg.error())
                break
            got.append(msg.value())
            if len(got) >= want:
                consumer.commit(msg, asynchronous=False)
                break
    finally:
        consumer.close()
    return got, errors


def topic_offsets(broker: AclBroker, topic: str) -> int:
    consumer = Consumer(broker.conf("admin", **{"group.id": "offsets-probe"}))
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    finally:
        consumer.close()


# -- the reader role --------------------------------------------------------------------------------

def test_reader_consumes_its_topic_and_group_but_cannot_produce(broker: AclBroker) -> None:
    got, errors = consume(broker.conf("reader"), "readable", "readers", 5)
    assert not errors and len(got) == 5
    failed = produce(broker.conf("reader"), "readable", 1, **{"enable.idempotence": False})
    assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert topic_offsets(broker, "readable") == 5  # nothing was written


def test_reader_in_another_group_gets_group_authorization_failed(broker: AclBroker) -> None:
    got, errors = consume(broker.conf("reader"), "readable", "not-mine", 1)
    assert not got
    assert [e.code() for e in errors] == [KafkaError.GROUP_AUTHORIZATION_FAILED]


# -- an unauthorized user: Kafka's exact codes ------------------------------------------------------

def test_unauthorized_user_produce_and_consume(broker: AclBroker) -> None:
    failed = produce(broker.conf("nobody"), "secret", 1, **{"enable.idempotence": False})
    assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    got, errors = consume(broker.conf("nobody"), "secret", "nobody-group", 1)
    assert not got and errors
    assert errors[0].code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED)
    assert topic_offsets(broker, "secret") == 0


def test_unauthorized_user_idempotent_producer_gets_cluster_authorization_failed(broker: AclBroker) -> None:
    # "shared" is visible to User:* (DESCRIBE), so the producer gets past Metadata to InitProducerId.
    before = topic_offsets(broker, "shared")
    producer = Producer(broker.conf("nobody", **{"enable.idempotence": True, "message.timeout.ms": 10000}))
    producer.produce("shared", b"x")
    with pytest.raises(KafkaException) as fatal:
        producer.flush(30)
    assert fatal.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert topic_offsets(broker, "shared") == before


def test_unauthorized_user_create_and_delete_topic(broker: AclBroker) -> None:
    admin = broker.admin("nobody")
    with pytest.raises(KafkaException) as created:
        admin.create_topics([NewTopic("nobody-topic", 1, 1)])["nobody-topic"].result(30)
    assert created.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as deleted:
        admin.delete_topics(["secret"])["secret"].result(30)
    assert deleted.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "nobody-topic" not in broker.admin().list_topics(timeout=10).topics
    assert "secret" in broker.admin().list_topics(timeout=10).topics


def test_unauthorized_user_transactional_init(broker: AclBroker) -> None:
    producer = Producer(broker.conf("nobody", **{"transactional.id": "nobody-txn"}))
    with pytest.raises(KafkaException) as init:
        producer.init_transactions(20)
    assert init.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_writer_with_create_auto_creates_and_idempotent_produces(broker: AclBroker) -> None:
    assert produce(broker.conf("writer"), "writable", 3, **{"enable.idempotence": True}) == []
    assert topic_offsets(broker, "writable") == 3


# -- super users, DENY, prefixes ---------------------------------------------------------------------

def test_super_user_bypasses_acls(broker: AclBroker) -> None:
    assert produce(broker.conf("admin"), "secret-admin", 2, **{"enable.idempotence": True}) == []
    got, errors = consume(broker.conf("admin"), "secret-admin", "any-group", 2)
    assert not errors and len(got) == 2


def test_deny_beats_allow(broker: AclBroker) -> None:
    # User:writer and User:denied may do ALL on "shared"; User:denied is also denied WRITE.
    assert produce(broker.conf("writer"), "shared", 1, **{"enable.idempotence": False}) == []
    failed = produce(broker.conf("denied"), "shared", 1, **{"enable.idempotence": False})
    assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert topic_offsets(broker, "shared") == 1


def test_prefixed_pattern(broker: AclBroker) -> None:
    assert produce(broker.conf("pfx"), "team-a.orders", 1, **{"enable.idempotence": False}) == []
    failed = produce(broker.conf("pfx"), "team-b.orders", 1, **{"enable.idempotence": False})
    assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # A transactional producer whose id matches its PREFIXED transactional-id ACL.
    producer = Producer(broker.conf("pfx", **{"transactional.id": "pfx-txn-1"}))
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce("team-a.orders", b"in-txn")
    producer.commit_transaction(20)
    assert topic_offsets(broker, "team-a.orders") == 3  # one record, one commit marker
    assert topic_offsets(broker, "team-b.orders") == 0



def test_topic_authorized_operations_from_literal_wildcard_prefixed_and_deny(broker: AclBroker) -> None:
    """What Metadata v8+ reports per topic (confluent-kafka's describe_topics), now from one
    lookup of the topic's ACLs in the index: ALL from a PREFIXED ACL gives every topic operation;
    ALL on the literal name minus a DENY of WRITE gives the others; a topic no ACL of the
    principal covers is not described."""
    every = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
             AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}

    def operations(user: str, topic: str) -> set[AclOperation]:
        admin = broker.admin(user)
        future = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic]
        return set(future.result(30).authorized_operations or [])

    assert operations("pfx", "team-a.orders") == every
    assert operations("denied", "shared") == every - {AclOperation.WRITE}
    with pytest.raises(KafkaException) as denied:
        operations("pfx", "team-b.orders")
    assert denied.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

# -- the anonymous PLAINTEXT principal ---------------------------------------------------------------

def test_anonymous_plaintext_client_is_denied(broker: AclBroker) -> None:
    failed = produce(broker.conf(None), "secret", 1, **{"enable.idempotence": False})
    assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    with RawClient(f"127.0.0.1:{broker.plain}") as raw:
        listing = raw.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 9)
        assert [t.name for t in listing.topics] == ["shared"]  # only what User:* may DESCRIBE
        named = raw.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="secret")],
                                            allow_auto_topic_creation=True), 9)
        assert [(t.name, t.error_code) for t in named.topics] == [("secret", TOPIC_AUTHORIZATION_FAILED)]
        join = raw.request(JoinGroupRequest(
            group_id="anon", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
            group_instance_id=None, protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")], reason=None), 9)
        assert join.error_code == GROUP_AUTHORIZATION_FAILED
        init = raw.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                                 producer_id=-1, producer_epoch=-1), 4)
        assert init.error_code == CLUSTER_AUTHORIZATION_FAILED
        txn = raw.request(InitProducerIdRequest(transactional_id="anon-txn", transaction_timeout_ms=60000,
                                                producer_id=-1, producer_epoch=-1), 4)
        assert txn.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert topic_offsets(broker, "secret") == 0
    log = broker.log_path.read_text()
    assert "Principal = User:ANONYMOUS is not authorized to DESCRIBE TOPIC:secret" in log


# -- the AdminClient ACL APIs, and persistence --------------------------------------------------------

def test_admin_client_acl_apis(broker: AclBroker) -> None:
    admin = broker.admin()
    binding = AclBinding(ResourceType.TOPIC, "admin-made", ResourcePatternType.LITERAL, "User:nobody", "*",
                         AclOperation.WRITE, AclPermissionType.ALLOW)
    admin.create_acls([binding])[binding].result(30)
    flt = AclBindingFilter(ResourceType.TOPIC, "admin-made", ResourcePatternType.ANY, None, None,
                           AclOperation.ANY, AclPermissionType.ANY)
    assert admin.describe_acls(flt).result(30) == [binding]
    # A non-super user may not manage ACLs: CLUSTER_AUTHORIZATION_FAILED.
    with RawClient(f"127.0.0.1:{broker.plain}") as raw:  # User:ANONYMOUS
        described = raw.request(DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
            host_filter=None, operation=1, permission_type=1), 3)
        assert (described.error_code, described.resources) == (CLUSTER_AUTHORIZATION_FAILED, [])
    nobody = broker.admin("nobody")
    with pytest.raises(KafkaException) as denied_create:
        nobody.create_acls([binding])[binding].result(30)
    assert denied_create.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    deleted = admin.delete_acls([flt])[flt].result(30)
    assert deleted == [binding]
    assert admin.describe_acls(flt).result(30) == []
    out = cli("acls", "list", data_dir=broker.data_dir)
    assert "admin-made" not in out.stdout and "TOPIC:LITERAL:readable User:reader ALLOW READ" in out.stdout


def test_acls_survive_a_restart(tmp_path: Path) -> None:
    b = start_acl_broker(tmp_path)
    try:
        admin = b.admin()
        binding = AclBinding(ResourceType.TOPIC, "kept", ResourcePatternType.LITERAL, "User:writer", "*",
                             AclOperation.WRITE, AclPermissionType.ALLOW)
        admin.create_acls([binding])[binding].result(30)
        admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)
    finally:
        b.proc.stop()
    b = start_acl_broker(tmp_path, b.data_dir)
    try:
        assert produce(b.conf("writer"), "kept", 1, **{"enable.idempotence": False}) == []
        failed = produce(b.conf("reader"), "kept", 1, **{"enable.idempotence": False})
        assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    finally:
        b.proc.stop()


def test_cli_change_reaches_a_running_broker(broker: AclBroker) -> None:
    failed = produce(broker.conf("nobody"), "late-grant", 1, **{"enable.idempotence": False})
    assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    acl_add(broker.data_dir, "--allow-principal", "User:nobody", "--operation", "WRITE", "--operation", "CREATE",
            "--topic", "late-grant")
    # The broker looks at the ACL file at most once a second, and a refused produce returns in
    # milliseconds: retry over a span of time (30 s), not a number of attempts.
    deadline = time.monotonic() + 30
    while produce(broker.conf("nobody"), "late-grant", 1, **{"enable.idempotence": False}) != []:
        if time.monotonic() > deadline:
            pytest.fail("the ACL added with the CLI never took effect")
        time.sleep(0.25)


# -- the least-privilege role sets of docs/SECURITY.md -------------------------------------------------

def doc_acl_commands() -> list[list[str]]:
    """The `ads-broker acls add` commands of docs/SECURITY.md's role section, as argument lists."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "SECURITY.md").read_text()
    section = text[text.index("### Least-privilege ACLs per role"):]
    commands = []
    for line in section.replace("\\\n", " ").splitlines():
        if line.startswith("ads-broker acls add --data-dir $D "):
            commands.append(line.split()[5:])
    return commands


def test_role_sets_of_the_docs(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    for user in ("admin", "worker", "audit", "loadgen"):
        assert cli("users", "add", user, data_dir=data_dir, password=PASSWORD).returncode == 0
    commands = doc_acl_commands()
    assert len(commands) >= 8
    for args in commands:
        acl_add(data_dir, *args)
    b = start_acl_broker(tmp_path, data_dir)
    try:
        admin = b.admin()
        for name in ("events", "events.deduped", "events.dlq"):
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        # Load generator: writes the input (idempotent), may not read it.
        assert produce(b.conf("loadgen"), "events", 3, **{"enable.idempotence": True}) == []
        _, errors = consume(b.conf("loadgen"), "events", "dedupe", 1)
        assert errors and errors[0].code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                               KafkaError.GROUP_AUTHORIZATION_FAILED)
        # Worker: the transactional consume-transform-produce step, with its config check.
        worker_admin = b.admin("worker")
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in ("events", "events.deduped", "events.dlq")]
        for future in worker_admin.describe_configs(resources).values():
            assert "cleanup.policy" in future.result(30)
        consumer = Consumer(b.conf("worker", **{"group.id": "dedupe", "enable.auto.commit": False,
                                                "auto.offset.reset": "earliest", "isolation.level": "read_committed"}))
        consumer.assign([TopicPartition("events", 0, 0)])
        got = []
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg)
            if len(got) == 3:
                break
        assert len(got) == 3
        producer = Producer(b.conf("worker", **{"transactional.id": "dedupe-events-0"}))
        producer.init_transactions(20)
        producer.begin_transaction()
        for msg in got:
            producer.produce("events.deduped", msg.value())
        producer.produce("events.dlq", b"bad")
        producer.send_offsets_to_transaction([TopicPartition("events", 0, 3)], consumer.consumer_group_metadata(), 20)
        producer.commit_transaction(20)
        consumer.close()
        assert topic_offsets(b, "events.deduped") == 4  # three records and the commit marker
        # ...and nothing else: not the input, not another transactional id.
        failed = produce(b.conf("worker"), "events", 1, **{"enable.idempotence": False})
        assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        with pytest.raises(KafkaException) as other_txn:
            Producer(b.conf("worker", **{"transactional.id": "other-events-0"})).init_transactions(20)
        assert other_txn.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        # Audit: reads the output, writes nothing.
        values, errors = consume(b.conf("audit"), "events.deduped", "spark-audit-1234", 3)
        assert not errors and len(values) == 3
        failed = produce(b.conf("audit"), "events.deduped", 1, **{"enable.idempotence": False})
        assert [e.code() for e in failed] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        assert topic_offsets(b, "events") == 3
    finally:
        b.proc.stop()


# -- the rest of the API table, with raw frames (User:ANONYMOUS on the PLAINTEXT listener) -------------

def test_every_api_answers_kafkas_code(broker: AclBroker) -> None:
    from kafka.protocol.admin import (
        DescribeConfigsRequest,
        DescribeGroupsRequest,
        DescribeUserScramCredentialsRequest,
        ListGroupsRequest,
    )
    from kafka.protocol.consumer import HeartbeatRequest, ListOffsetsRequest, OffsetFetchRequest
    from kafka.protocol.metadata import FindCoordinatorRequest
    from kafka.protocol.producer import AddPartitionsToTxnRequest, EndTxnRequest

    from tests.integration.broker.adminclient import commit_offset, create_partitions, delete_records, fetch_offset

    admin = broker.admin()
    group_acl = AclBinding(ResourceType.GROUP, "anon-g", ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                           AclOperation.READ, AclPermissionType.ALLOW)
    admin.create_acls([group_acl])[group_acl].result(30)
    # The group "readers" has committed offsets (here, or in the first test of the module).
    consume(broker.conf("reader"), "readable", "readers", 5)
    with RawClient(f"127.0.0.1:{broker.plain}") as raw:
        lo = raw.request(ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name="secret", partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=0, current_leader_epoch=-1, timestamp=-1)])]), 7)
        assert lo.topics[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert delete_records(raw, "readable", 0, 1) == TOPIC_AUTHORIZATION_FAILED
        assert create_partitions(raw, {"secret": 2}) == {"secret": TOPIC_AUTHORIZATION_FAILED}
        assert commit_offset(raw, "readers", "readable", 0, 1) == GROUP_AUTHORIZATION_FAILED
        assert commit_offset(raw, "anon-g", "secret", 0, 1) == TOPIC_AUTHORIZATION_FAILED  # group ok, topic not
        of = raw.request(OffsetFetchRequest(group_id="readers", topics=None, require_stable=False), 7)
        assert (of.error_code, of.topics) == (GROUP_AUTHORIZATION_FAILED, [])
        assert fetch_offset(raw, "anon-g", "secret", 0) == -1
        hb = raw.request(HeartbeatRequest(group_id="readers", generation_id=1, member_id="m",
                                          group_instance_id=None), 4)
        assert hb.error_code == GROUP_AUTHORIZATION_FAILED
        dg = raw.request(DescribeGroupsRequest(groups=["readers"], include_authorized_operations=False), 5)
        assert dg.groups[0].error_code == GROUP_AUTHORIZATION_FAILED
        lg = raw.request(ListGroupsRequest(states_filter=[]), 4)
        listed = [g.group_id for g in lg.groups]
        assert "readers" not in listed  # it exists, and is hidden
        assert "anon-g" in listed  # READ on the group implies DESCRIBE
        fc = raw.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["readers", "anon-g"]), 4)
        assert [c.error_code for c in fc.coordinators] == [GROUP_AUTHORIZATION_FAILED, 0]
        fct = raw.request(FindCoordinatorRequest(key_type=1, coordinator_keys=["some-txn"]), 4)
        assert fct.coordinators[0].error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        et = raw.request(EndTxnRequest(transactional_id="some-txn", producer_id=1, producer_epoch=0,
                                       committed=True), 3)
        assert et.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        ap = raw.request(AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="some-txn", v3_and_below_producer_id=1, v3_and_below_producer_epoch=0,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="secret", partitions=[0])]),
            3)
        assert ap.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == \
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        dc = raw.request(DescribeConfigsRequest(resources=[
            DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name="secret",
                                                           configuration_keys=None),
            DescribeConfigsRequest.DescribeConfigsResource(resource_type=4, resource_name="0",
                                                           configuration_keys=None)],
            include_synonyms=False, include_documentation=False), 4)
        assert [r.error_code for r in dc.results] == [TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED]
        scram = raw.request(DescribeUserScramCredentialsRequest(users=None), 0)
        assert scram.error_code == CLUSTER_AUTHORIZATION_FAILED and scram.results == []
    # Nothing was changed by any of these.
    check = broker.admin()
    assert len(check.list_topics("secret", timeout=10).topics["secret"].partitions) == 1
    admin.delete_acls([AclBindingFilter(ResourceType.GROUP, "anon-g", ResourcePatternType.LITERAL, None, None,
                                        AclOperation.ANY, AclPermissionType.ANY)])


def test_config_apis_need_alter_configs_and_log_dirs_need_cluster_describe(broker: AclBroker) -> None:
    """AlterConfigs/IncrementalAlterConfigs: ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED) or
    the cluster for the BROKER resource (CLUSTER_AUTHORIZATION_FAILED), per resource; ALTER_CONFIGS
    implies DESCRIBE_CONFIGS; DescribeLogDirs: DESCRIBE on the cluster (Kafka's ConfigAdminManager,
    ConfigHelper and KafkaApis)."""
    from kafka.protocol.admin import (
        AlterConfigsRequest,
        DescribeConfigsRequest,
        DescribeLogDirsRequest,
        IncrementalAlterConfigsRequest,
    )

    topic = f"anon-cfg-{uuid.uuid4().hex[:6]}"
    admin = broker.admin()
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    allow = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                       AclOperation.ALTER_CONFIGS, AclPermissionType.ALLOW)
    admin.create_acls([allow])[allow].result(30)
    inc, legacy = IncrementalAlterConfigsRequest.AlterConfigsResource, AlterConfigsRequest.AlterConfigsResource
    with RawClient(f"127.0.0.1:{broker.plain}") as raw:
        resp = raw.request(IncrementalAlterConfigsRequest(resources=[
            inc(resource_type=t, resource_name=n, configs=[inc.AlterableConfig(name=k, config_operation=0, value="7")])
            for t, n, k in ((2, "secret", "retention.ms"), (2, topic, "retention.ms"), (4, "0", "log.retention.ms"))],
            validate_only=False), 1)
        assert [r.error_code for r in resp.responses] == [TOPIC_AUTHORIZATION_FAILED, 0, CLUSTER_AUTHORIZATION_FAILED]
        resp = raw.request(AlterConfigsRequest(resources=[
            legacy(resource_type=t, resource_name=n, configs=[legacy.AlterableConfig(name="segment.ms", value="9")])
            for t, n in ((2, "secret"), (2, topic))], validate_only=False), 2)
        assert [r.error_code for r in resp.responses] == [TOPIC_AUTHORIZATION_FAILED, 0]
        dc = raw.request(DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=2, resource_name=topic, configuration_keys=["segment.ms", "retention.ms"])],
            include_synonyms=False, include_documentation=False), 4)
        assert [(e.name, e.value, e.config_source) for e in dc.results[0].configs] == [
            ("retention.ms", "604800000", 5), ("segment.ms", "9", 1)]  # AlterConfigs replaced the whole set
        ld = raw.request(DescribeLogDirsRequest(topics=None), 4)
        assert (ld.error_code, ld.results) == (CLUSTER_AUTHORIZATION_FAILED, [])
    [secret] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "secret")]).values()
    assert secret.result(30)["retention.ms"].value == "604800000"  # nothing changed where it was refused
    admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None,
                                        AclOperation.ANY, AclPermissionType.ANY)])


def test_acls_cli_add_list_remove_and_errors(tmp_path: Path) -> None:
    d = tmp_path / "data"
    acl_add(d, "--allow-principal", "User:a", "--operation", "READ", "--topic", "t", "--group", "g")
    acl_add(d, "--allow-principal", "User:b", "--operation", "WRITE", "--topic", "p.", "--resource-pattern-type",
            "PREFIXED")
    listed = cli("acls", "list", data_dir=d).stdout.splitlines()
    assert listed == ["TOPIC:LITERAL:t User:a ALLOW READ from host *", "GROUP:LITERAL:g User:a ALLOW READ from host *",
                      "TOPIC:PREFIXED:p. User:b ALLOW WRITE from host *"]
    assert cli("acls", "list", "--topic", "p.x", data_dir=d).stdout.splitlines() == [listed[2]]
    removed = cli("acls", "remove", "--allow-principal", "User:b", "--operation", "WRITE", "--topic", "p.",
                  "--resource-pattern-type", "PREFIXED", data_dir=d)
    assert removed.returncode == 0 and "removed TOPIC:PREFIXED:p." in removed.stdout
    assert cli("acls", "remove", "--group", "g", data_dir=d).returncode == 0
    assert cli("acls", "list", data_dir=d).stdout.splitlines() == [listed[0]]
    for bad in (["--allow-principal", "alice", "--operation", "READ", "--topic", "t"],
                ["--allow-principal", "User:a", "--operation", "READ_ALL", "--topic", "t"],
                ["--allow-principal", "User:a", "--operation", "READ"],
                ["--allow-principal", "User:a", "--operation", "READ", "--topic", "t", "--resource-pattern-type",
                 "MATCH"]):
        out = cli("acls", "add", *bad, data_dir=d)
        assert out.returncode == 1 and out.stderr.startswith("error: "), (bad, out.stderr)
    assert cli("acls", "remove", "--topic", "nothing-here", data_dir=d).returncode == 1
    assert cli("acls", "list", data_dir=d).stdout.splitlines() == [listed[0]]


def test_describe_groups_reports_the_group_authorized_operations(broker: AclBroker) -> None:
    """DescribeGroups v3+ with include_authorized_operations: the group operations the principal's
    ACLs allow (Kafka's handleDescribeGroupsRequest); null when not asked for; a group the
    principal may not DESCRIBE is GROUP_AUTHORIZATION_FAILED with no operations."""
    from kafka.protocol.admin import DescribeGroupsRequest

    from ads_broker.security.acl import ALTER_CONFIGS, DELETE, DESCRIBE, DESCRIBE_CONFIGS, READ
    from tests.integration.broker.rawclient import scram_login

    def describe(user: str, include: bool) -> Any:
        with RawClient(f"127.0.0.1:{broker.sasl}") as raw:
            assert scram_login(raw, user, PASSWORD).error_code == 0
            resp = raw.request(DescribeGroupsRequest(groups=["readers"], include_authorized_operations=include), 5)
            [group] = resp.groups
            return group

    assert describe("admin", True).authorized_operations == {READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS}
    reader = describe("reader", True)
    assert (reader.error_code, reader.authorized_operations) == (0, {READ, DESCRIBE})  # READ implies DESCRIBE
    assert describe("reader", False).authorized_operations is None
    nobody = describe("nobody", True)
    assert (nobody.error_code, nobody.authorized_operations) == (GROUP_AUTHORIZATION_FAILED, None)
