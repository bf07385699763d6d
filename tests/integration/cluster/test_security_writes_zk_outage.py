"""Security writes while ZooKeeper hangs (review finding 14, issue 12), through a real ZooKeeper
(SIGSTOPped) and a real ``ads-broker serve`` in cluster mode.

CreateAcls, DeleteAcls and AlterUserScramCredentials write ZooKeeper. They used to run on the event
loop's default executor, and a ZooKeeper request made while the connection is lost waits (kazoo
queues it) until ZooKeeper is back: each such request pinned one of the executor's few threads
(min(32, cores + 4)) for as long as ZooKeeper hung, after its client had been answered (a timeout),
and once they were all pinned the broker's other default-executor work (validating a Produce batch
over 32 KiB) waited with them. Now the writes have the ZooKeeper session's own two threads and,
while the connection is lost, are refused at once: UNKNOWN_SERVER_ERROR naming ZooKeeper, which is
what Kafka's authorizer and admin manager answer when their ZooKeeper write fails
(``ApiError.fromThrowable``).
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import AlterUserScramCredentialsRequest, CreateAclsRequest

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.embedded import free_port
from ads_broker.errors import UNKNOWN_SERVER_ERROR
from ads_broker.security.acl import ALLOW, LITERAL, READ, TOPIC
from tests.chaos.cluster.faults import produce_request
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import BrokerCluster, wait_until

pytestmark = pytest.mark.timeout(120)

#: More concurrent writes than the default executor has threads on this machine (cores + 4).
WRITES = (os.cpu_count() or 1) + 8


def create_acl(bootstrap: str, principal: str) -> tuple[int, str | None]:
    """(error code, message) of one CreateAcls v1 (READ on a literal topic for ``principal``)."""
    with RawClient(bootstrap) as raw:
        raw.sock.settimeout(60)
        result = raw.request(CreateAclsRequest(creations=[CreateAclsRequest.AclCreation(
            resource_type=TOPIC, resource_name="guarded", resource_pattern_type=LITERAL, principal=principal,
            host="*", operation=READ, permission_type=ALLOW)]), 1).results[0]
    return int(result.error_code), result.error_message


def test_security_writes_during_a_zookeeper_hang_fail_fast_and_hold_no_shared_threads(
        brokers: BrokerCluster, zk_server: ZooKeeperServer) -> None:
    port = free_port()
    brokers.start(1, port=port, **{
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "allow.everyone.if.no.acl.found": "true",  # ANONYMOUS may ALTER the cluster: no ACL on it
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"})
    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(60)
    assert create_acl(bootstrap, "User:before") == (0, None)

    assert zk_server.proc is not None
    os.kill(zk_server.proc.pid, signal.SIGSTOP)  # ZooKeeper hangs: the connection is lost, not refused
    try:
        wait_until(lambda: any(str(e.get("event", "")).startswith("ZooKeeper connection lost: the ACLs")
                               for e in brokers.log_events(1)), "broker 1 to notice the outage")
        answers: list[tuple[int, str | None]] = []
        writers = [threading.Thread(target=lambda i=i: answers.append(create_acl(bootstrap, f"User:w{i}")))
                   for i in range(WRITES)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        assert len(answers) == WRITES
        for code, message in answers:
            assert code == UNKNOWN_SERVER_ERROR
            assert message is not None and "ZooKeeper" in message and "unreachable" in message, message
        with RawClient(bootstrap) as raw:
            altered = raw.request(AlterUserScramCredentialsRequest(deletions=[], upsertions=[
                AlterUserScramCredentialsRequest.ScramCredentialUpsertion(
                    name="late", mechanism=1, iterations=4096, salt=b"s" * 16, salted_password=b"p" * 32)]), 0)
            assert [(r.user, r.error_code) for r in altered.results] == [("late", UNKNOWN_SERVER_ERROR)]
            assert "unreachable" in altered.results[0].error_message
            # The broker's other threaded work goes on: a 40 KB batch is validated on the default executor.
            raw.sock.settimeout(30)
            produced = raw.request(produce_request(topic, b"x" * 40_000, acks=1), 9)
            assert produced.responses[0].partition_responses[0].error_code == 0
    finally:
        os.kill(zk_server.proc.pid, signal.SIGCONT)
    wait_until(lambda: any(e.get("event") == "ZooKeeper connection back: ACLs and SCRAM credentials read again"
                           for e in brokers.log_events(1)), "broker 1 to read the security data again")
    assert create_acl(bootstrap, "User:after") == (0, None)
