"""A three-broker cluster whose brokers log in to each other on a SASL inter-broker listener, with
the ACL authorizer on: each broker has the SASL listener (first, so Metadata names it; SASL_PLAINTEXT,
or SASL_SSL with the test PKI) and a PLAINTEXT one (``User:ANONYMOUS``, where an attacker without
credentials connects). Users and ACLs are written into the cluster's ZooKeeper before the first start (what
``ads-broker users add --zookeeper-connect`` / ``acls add --zookeeper-connect`` write, done in
process to keep the tests fast):
``broker`` (the brokers' own principal, in ``super.users``), ``admin`` (in ``super.users``) and
``mallory`` (may read and write the test topics, nothing on the cluster).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.embedded import free_port
from ads_broker.security.acl import ALLOW, PREFIXED, READ, TOPIC, WRITE, Acl
from ads_broker.security.sasl_client import LOGIN_MODULES
from ads_broker.security.scram import ScramCredential
from ads_broker.security.zk_store import ZkSecurityData
from tests.integration.cluster.conftest import IDS, BrokerCluster, wait_until

PASSWORD = "pw-" + uuid.uuid4().hex[:12]
USERS = ("broker", "admin", "mallory")


def jaas(mechanism: str, password: str = PASSWORD) -> str:
    return f'{LOGIN_MODULES[mechanism]} required username="broker" password="{password}";'


@dataclass
class SaslCluster:
    brokers: BrokerCluster
    protocol: str
    mechanism: str
    ca: Path | None
    sasl_ports: dict[int, int] = field(default_factory=dict)
    plain_ports: dict[int, int] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        """The SASL listeners (what Metadata names: the first listener)."""
        return ",".join(f"127.0.0.1:{p}" for p in self.sasl_ports.values())

    def sasl(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.sasl_ports[broker_id]}"

    def plain(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.plain_ports[broker_id]}"

    def client_conf(self, user: str = "admin", **extra: Any) -> dict[str, Any]:
        conf = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol,
                "sasl.mechanisms": self.mechanism, "sasl.username": user, "sasl.password": PASSWORD,
                "broker.address.family": "v4", **extra}
        if self.ca is not None:
            conf["ssl.ca.location"] = str(self.ca)
        return conf

    def admin(self) -> AdminClient:
        return AdminClient(self.client_conf())


class ZkSecurityWriter:
    """An operator's session on the cluster's ACL and user znodes (what ``ads-broker users|acls
    --zookeeper-connect`` does), for tests that change them while the brokers run."""

    def __init__(self, zk_connect: str) -> None:
        self.zk = KafkaZkClient(zk_connect).start()
        self.data = ZkSecurityData(self.zk.client)
        self.data.ensure_paths()

    def __enter__(self) -> ZkSecurityData:
        return self.data

    def __exit__(self, *exc: object) -> None:
        self.zk.close()


def set_password(data: ZkSecurityData, user: str, mechanism: str, password: str) -> None:
    credential = ScramCredential.from_password(mechanism, password)
    data.update_user(user, lambda current: {**current, mechanism: credential})


def _provision(zk_connect: str, mechanism: str, topic_prefix: str) -> None:
    scram = mechanism if mechanism != "PLAIN" else "SCRAM-SHA-256"  # PLAIN is checked against SCRAM credentials
    with ZkSecurityWriter(zk_connect) as data:
        for user in USERS:
            set_password(data, user, scram, PASSWORD)
        data.create_acls([Acl(TOPIC, topic_prefix, PREFIXED, "User:mallory", "*", op, ALLOW) for op in (READ, WRITE)])


def start_three_sasl(brokers: BrokerCluster, topic_prefix: str = "t-", *, protocol: str = "SASL_PLAINTEXT",
                     mechanism: str = "SCRAM-SHA-256", keystore: Path | None = None, ca: Path | None = None,
                     per_broker: dict[int, dict[str, str]] | None = None, provision: bool = True,
                     **config: str) -> SaslCluster:
    """Brokers 1-3 with ``protocol``/``mechanism`` between them; returns once all three are
    registered. SASL_SSL needs ``keystore`` (chain + key, SAN 127.0.0.1) and ``ca``;
    ``per_broker`` adds settings to one broker only; ``provision=False``: the caller wrote the
    users and ACLs to ZooKeeper itself."""
    cluster = SaslCluster(brokers, protocol, mechanism, ca)
    tls: dict[str, str] = {}
    if protocol == "SASL_SSL":
        assert keystore is not None and ca is not None
        tls = {"ssl.keystore.location": str(keystore), "ssl.truststore.location": str(ca)}
    if provision:
        _provision(brokers.zk_connect, mechanism, topic_prefix)
    for broker_id in IDS:
        sasl, plain = free_port(), free_port()
        cluster.sasl_ports[broker_id], cluster.plain_ports[broker_id] = sasl, plain
        brokers.start(broker_id, port=plain, **{
            "listeners": f"{protocol}://127.0.0.1:{sasl},PLAINTEXT://127.0.0.1:{plain}",
            "inter.broker.listener.name": protocol,
            "sasl.enabled.mechanisms": mechanism,
            "sasl.mechanism.inter.broker.protocol": mechanism,
            f"listener.name.{protocol.lower()}.{mechanism.lower()}.sasl.jaas.config": jaas(mechanism),
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:broker;User:admin",
            "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
            **tls, **config, **(per_broker or {}).get(broker_id, {})})
    admin = cluster.admin()
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    return cluster
