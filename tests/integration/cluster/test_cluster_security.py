"""ACLs and SCRAM credentials shared by the whole cluster through ZooKeeper (issues 12 + 13,
docs/SECURITY.md "Cluster mode"), through real ZooKeeper and real ``ads-broker serve`` processes:
concurrent changes through two brokers, a user added through one broker logging in at another,
bootstrap with the CLI before any broker runs, a data dir's single-node files refused, a
ZooKeeper outage (last state kept; everything re-read on reconnection) and a replica fetcher
whose re-authentication is refused (it reconnects; the partition keeps replicating).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin import AlterUserScramCredentialsRequest, CreateAclsRequest, DescribeAclsRequest

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.errors import CLUSTER_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED
from ads_broker.exceptions import BrokerError
from ads_broker.security.acl import ACL_FILE, ALLOW, DENY, PREFIXED, READ, TOPIC, WRITE, Acl, AclStore
from ads_broker.security.scram import CREDENTIALS_FILE, CredentialStore, ScramCredential
from ads_broker.security.zk_store import acl_path, encode_acls
from tests.chaos.cluster.faults import produce_request
from tests.integration.broker.rawclient import RawClient, scram_login
from tests.integration.cluster.conftest import IDS, BrokerCluster, _poll, wait_until
from tests.integration.cluster.secure import PASSWORD, ZkSecurityWriter, set_password, start_three_sasl
from tests.integration.cluster.test_replication import local_records, state

pytestmark = pytest.mark.timeout(120)

#: A deadline for a change made through one broker to reach the others (a ZooKeeper notification);
#: generous, not a timing assertion.
PROPAGATION_S = 10.0
#: CreateAcls requests sent through each of two brokers at once, all on one resource.
PER_BROKER = 12


def _admin_login(cluster_address: str) -> RawClient:
    raw = RawClient(cluster_address)
    assert scram_login(raw, "admin", PASSWORD).error_code == 0
    return raw


def _acls_on(raw: RawClient, topic: str) -> set[str]:
    """The principals of the ACLs on the literal topic resource, as DescribeAcls answers."""
    answer = raw.request(DescribeAclsRequest(resource_type_filter=TOPIC, resource_name_filter=topic,
                                             pattern_type_filter=3, principal_filter=None, host_filter=None,
                                             operation=1, permission_type=1), 1)
    assert answer.error_code == 0, answer
    return {a.principal for r in answer.resources for a in r.acls}


def test_concurrent_create_acls_through_two_brokers_lose_none(brokers: BrokerCluster, zk_connect: str) -> None:
    """Kafka's ``updateResourceAcls`` writes a resource's ACLs conditionally on the znode version
    it read and retries on a conflict, so CreateAcls requests for one resource sent through two
    brokers at once all land. Each request here adds one ACL on the same topic resource; broker
    3, which received none of them, describes every one."""
    cluster = start_three_sasl(brokers)
    topic = f"shared-{uuid.uuid4().hex[:6]}"
    errors: list[object] = []

    def create_through(broker_id: int) -> None:
        try:
            with _admin_login(cluster.sasl(broker_id)) as raw:
                for i in range(PER_BROKER):
                    creation = CreateAclsRequest.AclCreation(
                        resource_type=TOPIC, resource_name=topic, resource_pattern_type=3,
                        principal=f"User:via{broker_id}-{i}", host="*", operation=READ, permission_type=ALLOW)
                    answer = raw.request(CreateAclsRequest(creations=[creation]), 1)
                    errors.extend(r for r in answer.results if r.error_code)
        except Exception as e:  # reported below, with the test's own assertion
            errors.append(e)

    threads = [threading.Thread(target=create_through, args=(b,)) for b in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    expected = {f"User:via{b}-{i}" for b in (1, 2) for i in range(PER_BROKER)}
    with _admin_login(cluster.sasl(3)) as raw:
        _poll(lambda: _acls_on(raw, topic) == expected, PROPAGATION_S)
        assert _acls_on(raw, topic) == expected
    with ZkSecurityWriter(zk_connect) as data:  # and in ZooKeeper, in Kafka's format
        stored, _ = data.resource_acls((TOPIC, topic, 3))
        raw_json = json.loads(data.client.get(f"/kafka-acl/Topic/{topic}")[0])
    assert {a.principal for a in stored} == expected
    assert raw_json["version"] == 1
    assert raw_json["acls"][0].keys() == {"principal", "permissionType", "operation", "host"}
    assert {(e["permissionType"], e["operation"]) for e in raw_json["acls"]} == {("Allow", "Read")}


def test_a_credential_added_through_broker_1_logs_in_at_broker_3(brokers: BrokerCluster) -> None:
    """AlterUserScramCredentials through one broker (Kafka: ``/config/users/<user>`` and a
    ``/config/changes`` notification) lets the user log in at every broker; deleting it through
    another broker shuts it out of every one."""
    cluster = start_three_sasl(brokers)
    user, password = f"carol-{uuid.uuid4().hex[:6]}", "pw-" + secrets.token_hex(8)
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 4096)
    upsert = AlterUserScramCredentialsRequest.ScramCredentialUpsertion(
        name=user, mechanism=1, iterations=4096, salt=salt, salted_password=salted)
    with _admin_login(cluster.sasl(1)) as raw:
        answer = raw.request(AlterUserScramCredentialsRequest(deletions=[], upsertions=[upsert]), 0)
    assert [r.error_code for r in answer.results] == [0]

    def login_code(broker_id: int) -> int:
        with RawClient(cluster.sasl(broker_id)) as raw:
            return int(scram_login(raw, user, password).error_code)

    _poll(lambda: login_code(3) == 0, PROPAGATION_S)
    assert login_code(3) == 0
    assert login_code(2) == 0

    admin = cluster.admin()  # an AdminClient: sent to whichever broker it picks
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password.encode() + b"-changed")],
        request_timeout=30)[user].result()
    _poll(lambda: all(login_code(b) != 0 for b in IDS), PROPAGATION_S)
    assert [login_code(b) for b in IDS] == [58, 58, 58]


def _create_rf3(admin: AdminClient, topic: str) -> None:
    """One partition on brokers 1, 2, 3 (1 leads), ``min.insync.replicas=3``: an acks=all write
    needs both followers fetching."""
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "3"})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ads_broker", *args], capture_output=True, text=True, timeout=120)


def test_users_and_acls_bootstrapped_with_the_cli_before_the_brokers_start(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Kafka's ``kafka-configs --zookeeper ... --entity-type users`` and ``kafka-acls
    --authorizer-properties zookeeper.connect=...`` write to ZooKeeper before any broker runs, so
    the inter-broker user exists when the brokers start: here ``ads-broker users add`` and
    ``acls add --zookeeper-connect`` do it, the brokers log in to each other (an acks=all write
    with min.insync.replicas=3 is acknowledged) and mallory's ACL applies."""
    for user in ("broker", "admin", "mallory"):
        done = _cli("users", "add", user, "--zookeeper-connect", zk_connect, "--password", PASSWORD,
                    "--mechanism", "SCRAM-SHA-256")
        assert done.returncode == 0, done.stderr
    done = _cli("acls", "add", "--zookeeper-connect", zk_connect, "--allow-principal", "User:mallory",
                "--operation", "WRITE", "--operation", "READ", "--topic", "t-", "--resource-pattern-type", "PREFIXED")
    assert done.returncode == 0, done.stderr
    listed = _cli("users", "list", "--zookeeper-connect", zk_connect)
    assert listed.returncode == 0 and [line.split("\t")[0] for line in listed.stdout.splitlines()] == [
        "admin", "broker", "mallory"], listed
    assert PASSWORD not in listed.stdout
    acls = _cli("acls", "list", "--zookeeper-connect", zk_connect, "--principal", "User:mallory")
    assert sorted(acls.stdout.splitlines()) == [
        "TOPIC:PREFIXED:t- User:mallory ALLOW READ from host *",
        "TOPIC:PREFIXED:t- User:mallory ALLOW WRITE from host *"]

    cluster = start_three_sasl(brokers, provision=False)
    topic = f"t-{uuid.uuid4().hex[:8]}"
    _create_rf3(cluster.admin(), topic)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "a full ISR (the brokers logged in)")
    producer = Producer(cluster.client_conf("mallory", acks="all", **{"linger.ms": 0, "message.timeout.ms": 30000}))
    producer.produce(topic, value=b"bootstrapped", partition=0)
    assert producer.flush(30) == 0
    leader = state(zk_connect, topic).leader
    with RawClient(cluster.sasl(leader)) as raw:
        assert scram_login(raw, "mallory", PASSWORD).error_code == 0
        answer = raw.request(produce_request(f"u-{topic}", b"x", 1), 9)  # outside mallory's prefix
    assert answer.responses[0].partition_responses[0].error_code == TOPIC_AUTHORIZATION_FAILED

    removed = _cli("acls", "remove", "--zookeeper-connect", zk_connect, "--allow-principal", "User:mallory",
                   "--operation", "WRITE", "--topic", "t-", "--resource-pattern-type", "PREFIXED")
    assert removed.returncode == 0, removed.stderr

    def mallory_write_code() -> int:
        with RawClient(cluster.sasl(leader)) as raw:
            assert scram_login(raw, "mallory", PASSWORD).error_code == 0
            return int(raw.request(produce_request(topic, b"y", 1), 9).responses[0].partition_responses[0].error_code)

    _poll(lambda: mallory_write_code() == TOPIC_AUTHORIZATION_FAILED, PROPAGATION_S)
    assert mallory_write_code() == TOPIC_AUTHORIZATION_FAILED


def test_a_data_dir_acl_file_is_refused_in_cluster_mode_until_migrated(brokers: BrokerCluster,
                                                                        zk_connect: str) -> None:
    """Kafka has no data-dir ACL or credential file; a single node's ``__acls.json`` found by a
    broker started with ``zookeeper.connect`` would be a second source of truth (or, imported
    silently, could give back a right revoked through another broker). The broker refuses to start
    and says what to do; ``ads-broker acls migrate`` moves the file's ACLs to ZooKeeper once (the
    file is renamed) and the broker starts, the ACLs in force."""
    data_dir = brokers.data_dir(1)
    data_dir.mkdir(parents=True)
    AclStore(data_dir).save([Acl(TOPIC, "legacy-", PREFIXED, "User:old", "*", READ, ALLOW)])
    with pytest.raises(BrokerError):
        brokers.start(1)
    log_text = (brokers.root / "broker-1.log").read_text(errors="replace")
    assert f"{data_dir / ACL_FILE}" in log_text and "ads-broker acls migrate" in log_text, log_text[-2000:]

    done = _cli("acls", "migrate", "--data-dir", str(data_dir), "--zookeeper-connect", zk_connect)
    assert done.returncode == 0, done.stderr
    assert "added TOPIC:PREFIXED:legacy- User:old ALLOW READ from host *" in done.stdout
    assert not (data_dir / ACL_FILE).exists() and (data_dir / (ACL_FILE + ".migrated")).exists()
    brokers.start(1, **{"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    with ZkSecurityWriter(zk_connect) as data:
        stored, _ = data.resource_acls((TOPIC, "legacy-", PREFIXED))
    assert stored == [Acl(TOPIC, "legacy-", PREFIXED, "User:old", "*", READ, ALLOW)]


def test_users_migrate_moves_a_data_dir_credentials_file_and_keeps_what_zookeeper_has(
        zk_connect: str, tmp_path: Path) -> None:
    """``ads-broker users migrate``: each user of the file is added to ``/config/users``; a
    credential ZooKeeper already holds for a user and mechanism wins (it may be newer: a password
    changed through the cluster must not be rolled back by an old file); the file is renamed."""
    data_dir = tmp_path / "data"
    store = CredentialStore(data_dir)
    for user in ("dave", "erin"):
        store.upsert(user, "SCRAM-SHA-256", ScramCredential.from_password("SCRAM-SHA-256", "old-" + user))
    with ZkSecurityWriter(zk_connect) as data:
        set_password(data, "erin", "SCRAM-SHA-256", "newer")
        erin_before = data.user_credentials("erin")[0]
    done = _cli("users", "migrate", "--data-dir", str(data_dir), "--zookeeper-connect", zk_connect)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["user dave: added SCRAM-SHA-256",
                                            "user erin: nothing added; kept ZooKeeper's SCRAM-SHA-256"]
    assert not (data_dir / CREDENTIALS_FILE).exists() and (data_dir / (CREDENTIALS_FILE + ".migrated")).exists()
    with ZkSecurityWriter(zk_connect) as data:
        assert data.user_credentials("dave")[0] == store_of(data_dir, "dave")
        assert data.user_credentials("erin")[0] == erin_before


def store_of(data_dir: Path, user: str) -> dict[str, ScramCredential]:
    """The credentials the migrated (renamed) file held for ``user``."""
    raw = json.loads((data_dir / (CREDENTIALS_FILE + ".migrated")).read_text())["users"][user]
    return {m: ScramCredential.from_json(c) for m, c in raw.items()}


def test_zookeeper_outage_keeps_the_last_state_and_reconnection_reads_everything_again(
        brokers: BrokerCluster, zk_server: ZooKeeperServer, zk_connect: str, tmp_path: Path) -> None:
    """A lost ZooKeeper connection changes nothing a broker decides (Kafka's authorizer keeps its
    cache: never allow-all, never deny-all), and since a watch can be missed while disconnected
    (or across a session expiry), every reconnection re-reads all ACLs and users. Here a DENY is
    written straight into the ACL znode with no change notification (as a missed one would be):
    the brokers keep the state they read, ZooKeeper is SIGKILLed, logins and authorization go on
    as before (mallory writes; mallory's DescribeAcls is still denied), and after ZooKeeper is back
    the DENY is in force on every broker."""
    cluster = start_three_sasl(brokers)
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = cluster.admin()  # kept referenced until the result is in
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2, 3]])], operation_timeout=30)[topic].result(60)
    wait_until(lambda: state(zk_connect, topic).leader == 1, "broker 1 to lead")

    def mallory() -> tuple[int, int]:
        """(produce error, DescribeAcls error) for mallory at broker 1."""
        with RawClient(cluster.sasl(1)) as raw:
            assert scram_login(raw, "mallory", PASSWORD).error_code == 0
            produced = raw.request(produce_request(topic, b"m", 1), 9).responses[0].partition_responses[0].error_code
            described = raw.request(DescribeAclsRequest(
                resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                host_filter=None, operation=1, permission_type=1), 1).error_code
        return int(produced), int(described)

    assert mallory() == (0, CLUSTER_AUTHORIZATION_FAILED)
    prefix = (TOPIC, "t-", PREFIXED)
    with ZkSecurityWriter(zk_connect) as data:  # no notification: the brokers are not told
        current, version = data.resource_acls(prefix)
        deny = Acl(TOPIC, "t-", PREFIXED, "User:mallory", "*", WRITE, DENY)
        data.client.set(acl_path(prefix), encode_acls([*current, deny]), version=version)
    zk_server.kill()
    try:
        wait_until(lambda: any(str(e.get("event", "")).startswith("ZooKeeper connection lost: the ACLs")
                               for e in brokers.log_events(1)), "broker 1 to notice the outage")
        assert mallory() == (0, CLUSTER_AUTHORIZATION_FAILED)  # the state last read, neither more nor less
    finally:
        zk_server.start()
    _poll(lambda: mallory()[0] == TOPIC_AUTHORIZATION_FAILED, PROPAGATION_S + brokers.session_timeout_ms / 1000)
    assert mallory() == (TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED)
    assert any(e.get("event") == "ZooKeeper connection back: ACLs and SCRAM credentials read again"
               for e in brokers.log_events(1))


#: Short SASL sessions, so the followers re-authenticate every second or so.
REAUTH_MS = 1500


def test_a_follower_whose_re_authentication_is_refused_reconnects_and_keeps_replicating(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Kafka's NetworkClient closes a connection whose re-authentication failed and connects again
    after the backoff. The brokers' own user's credential is changed through the API (the followers
    still present the old password), so their next re-authentication is refused: each says so in
    a warning and keeps retrying; once the credential is restored they log in again and the
    partition keeps replicating (acks=all with min.insync.replicas=3 is acknowledged and every
    replica holds every record). Before the F1 fix the refusal ended the fetcher silently."""
    cluster = start_three_sasl(brokers, **{"connections.max.reauth.ms": str(REAUTH_MS),
                                           "replica.fetch.wait.max.ms": "100", "replica.fetch.backoff.ms": "200",
                                           # no ISR shrink (and fetcher restart by a new state) to hide a dead fetcher
                                           "replica.lag.time.max.ms": "600000"})
    topic = f"t-{uuid.uuid4().hex[:8]}"
    _create_rf3(cluster.admin(), topic)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "a full ISR")
    producer = Producer(cluster.client_conf(acks="all", **{"linger.ms": 0, "message.timeout.ms": 60000}))
    producer.produce(topic, value=b"before", partition=0)
    assert producer.flush(60) == 0

    with ZkSecurityWriter(zk_connect) as data:  # what AlterUserScramCredentials writes
        set_password(data, "broker", "SCRAM-SHA-256", "rotated-" + secrets.token_hex(6))

    def refused() -> list[dict[str, object]]:
        return [e for b in (2, 3) for e in brokers.log_events(b)
                if e.get("event") == "re-authentication to the leader refused; reconnecting"]

    _poll(lambda: refused(), 60)  # asserted at the end, once replication is checked
    with ZkSecurityWriter(zk_connect) as data:
        set_password(data, "broker", "SCRAM-SHA-256", PASSWORD)
    after = [b"after-%d" % i for i in range(5)]
    for value in after:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(60) == 0  # min.insync.replicas=3: both followers are fetching again
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "a full ISR")
    for follower in (2, 3):
        brokers.procs[follower].kill()
        assert [v for _, v in local_records(brokers.data_dir(follower), topic)] == [b"before", *after]
    assert refused(), "no follower logged a refused re-authentication"
    assert PASSWORD not in json.dumps(refused())
