"""Three real brokers (real ZooKeeper) that log in to each other on their inter-broker listener
under the ACL authorizer (``tests/integration/cluster/secure.py``): SASL_PLAINTEXT with
SCRAM-SHA-256, and SASL_SSL with PLAIN (the brokers verify each other's certificate, host name
included). The replica fetchers and the transaction marker sender log in as ``User:broker`` (in
``super.users``), so replication and transactions across brokers work, and the broker logs never
show the password.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import NewTopic

from tests.integration.broker.test_security import Pki, pki
from tests.integration.cluster.conftest import IDS, BrokerCluster, wait_until
from tests.integration.cluster.secure import PASSWORD, jaas, start_three_sasl
from tests.integration.cluster.test_replication import create, local_records, state

pytestmark = pytest.mark.timeout(240)
__all__ = ["pki"]  # the test PKI fixture (a CA and a server certificate for 127.0.0.1)


def _consume(conf: dict[str, object], topic: str, partitions: int, count: int) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    got: list[bytes] = []
    try:
        consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(partitions)])

        def done() -> bool:
            got.extend(m.value() for m in consumer.consume(1000, 1.0) if m.error() is None)
            return len(got) >= count

        wait_until(done, f"{count} records of {topic}")
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize(("protocol", "mechanism"), [("SASL_PLAINTEXT", "SCRAM-SHA-256"), ("SASL_SSL", "PLAIN")])
def test_brokers_replicate_and_send_markers_over_a_sasl_inter_broker_listener_with_the_authorizer_on(
        brokers: BrokerCluster, zk_connect: str, pki: Pki, protocol: str, mechanism: str) -> None:
    cluster = start_three_sasl(brokers, protocol=protocol, mechanism=mechanism, keystore=pki.server, ca=pki.ca)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    partitions = 3
    create(cluster.admin(), topic, partitions=partitions, min_isr=2)

    # acks=all with min.insync.replicas=2: acknowledged only once a follower fetched it (over SASL).
    producer = Producer(cluster.client_conf(acks="all", **{"linger.ms": 5, "message.timeout.ms": 60000}))
    acked: list[bytes] = []
    values = [b"r%03d" % i for i in range(60)]
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions,
                         on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)
    assert producer.flush(60) == 0
    assert sorted(acked) == values
    for p in range(partitions):
        wait_until(lambda p=p: sorted(state(zk_connect, topic, p).isr) == list(IDS), f"a full ISR for partition {p}")

    # A transaction over the three partitions, whose leaders are three brokers: the coordinator
    # sends WriteTxnMarkers to the other two over the inter-broker listener (CLUSTER_ACTION).
    txn = Producer(cluster.client_conf(**{"transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}))
    txn.init_transactions(60)
    txn.begin_transaction()
    committed = [b"t%d" % p for p in range(partitions)]
    for p, value in enumerate(committed):
        txn.produce(topic, value=value, partition=p)
    txn.commit_transaction(60)
    leaders = {state(zk_connect, topic, p).leader for p in range(partitions)}
    assert len(leaders) == partitions, leaders  # the markers really crossed brokers

    seen = _consume(cluster.client_conf(**{"isolation.level": "read_committed"}), topic, partitions,
                    len(values) + partitions)
    assert sorted(seen) == sorted(values + committed)

    for broker_id in IDS:
        text = (brokers.root / f"broker-{broker_id}.log").read_text(errors="replace")
        assert PASSWORD not in text, f"broker {broker_id} logged the inter-broker password"
        assert "cannot log in" not in text, f"broker {broker_id}: an inter-broker login failed"


def test_a_broker_whose_inter_broker_login_is_refused_replicates_nothing_and_logs_no_password(
        brokers: BrokerCluster, zk_connect: str) -> None:
    wrong = "wrong-" + uuid.uuid4().hex[:10]
    cluster = start_three_sasl(brokers, per_broker={3: {
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": jaas("SCRAM-SHA-256", wrong)}},
        **{"replica.lag.time.max.ms": "2000"})
    topic = f"t-{uuid.uuid4().hex[:10]}"
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"})
    admin = cluster.admin()
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    producer = Producer(cluster.client_conf(acks="all", **{"message.timeout.ms": 60000}))
    producer.produce(topic, value=b"kept", partition=0)
    assert producer.flush(60) == 0  # brokers 1 and 2 hold it
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == [1, 2], "broker 3 to leave the ISR")
    assert local_records(brokers.data_dir(3), topic) == []
    refused = [e for e in brokers.log_events(3) if e.get("event") == "cannot log in to the leader's inter-broker "
               "listener"]
    assert refused and "SCRAM-SHA-256 login as 'broker' refused" in str(refused[0].get("error")), refused[:1]
    for broker_id in IDS:
        text = (brokers.root / f"broker-{broker_id}.log").read_text(errors="replace")
        assert wrong not in text and PASSWORD not in text, f"broker {broker_id} logged a password"


def test_followers_whose_principal_lacks_cluster_action_copy_nothing_and_say_what_to_grant(
        brokers: BrokerCluster, zk_connect: str) -> None:
    # The brokers log in fine, but User:broker is neither a super user nor granted CLUSTER_ACTION.
    cluster = start_three_sasl(brokers, **{"super.users": "User:admin", "replica.lag.time.max.ms": "2000"})
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin = cluster.admin()
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    wait_until(lambda: state(zk_connect, topic).isr == (1,), "the denied followers to leave the ISR")
    producer = Producer(cluster.client_conf(acks="all", **{"message.timeout.ms": 5000}))
    failed: list[object] = []
    producer.produce(topic, value=b"x", partition=0, on_delivery=lambda err, msg: failed.append(err))
    producer.flush(30)
    assert failed and failed[0] is not None, "acks=all was acknowledged with no follower able to fetch"
    for follower in (2, 3):
        assert local_records(brokers.data_dir(follower), topic) == []
        warnings = [e for e in brokers.log_events(follower)
                    if str(e.get("event", "")).startswith("the leader's authorizer refused this broker's follower")]
        assert warnings and warnings[0].get("error") == "TOPIC_AUTHORIZATION_FAILED", warnings[:1]
